"""Retrieval, then read: two-hop questions in pools of distractor stories, one retriever +
reader per retrieval mode and pool size. Entry point: experiments/retrieve.py."""

from attn.common.applications import APPS, App

APPS.add("retrieve", App("experiments.retrieve", "retrieval, then read: recall@k and accuracy",
                         task="attn.apps.retrieve.task:RetrieveTask",
                         launchable=False, results_file="retrieve.json"))
