"""The tiny run the loop tests share: a few prompts of short answers, one thread, no progress bar."""

ADD_REVERSE = "{add: {difficulty: 1}, reverse: {difficulty: 1}}"


def tiny(domains: str = ADD_REVERSE) -> list[str]:
    """Dotted overrides for a run of 4 prompts x 4 samples of at most 6 tokens on `domains`."""
    return [
        "rollout.prompts_per_step=4",
        "rollout.group_size=4",
        "rollout.max_tokens=6",
        "eval.tasks_per_domain=8",
        "eval.max_tokens=6",
        "run.threads=1",
        "run.progress=false",
        f"tasks.domains={domains}",
    ]
