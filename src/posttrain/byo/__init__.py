"""Bring your own tasks, verifiers and domains: task files and local data sets as domains
(`sources`, `domain`, `build`), verifiers by name with parameters (`verifiers`), Python
callables by import path (`pycall`), reward models and LLM judges (`models`), plugin entry
points (`plugins`), and the checks behind `posttrain tasks` (`checks`). `config` is the
torch-free configuration at the bottom. See docs/byo.md."""
