"""Bring your own tasks, verifiers and domains: task files and local data sets as domains
(`sources`, `domain`, `build`), verifiers by name with parameters (`verifiers`), Python
callables by import path (`pycall`), reward models and LLM judges (`models`), plugin
verifiers (`plugins`; plugin domains load in `domains/plugins.py`), and the checks behind
`posttrain tasks` (`checks`). The configuration is `posttrain.configs.byo`. See docs/byo.md."""
