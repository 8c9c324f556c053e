"""Next-item recommendation on a generated interaction log with planted triggers: SASRec-style
self-attention against mean-pooling and a GRU. Entry point: experiments/recommend.py."""

from attn.common.applications import APPS, App

APPS.add("recommend", App("experiments.recommend",
                          "next-item recommendation: self-attention, mean-pooling, GRU",
                          task="attn.apps.recommend.task:RecommendTask",
                          diagnose="attn.apps.recommend.diagnosis:diagnose_workdir"))
