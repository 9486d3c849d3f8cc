"""posttrain.envs: multi-turn episodes on the Environment contract (reset, step, close).

Invariant: an environment's observations enter the model's context with loss
mask 0, so the loss covers only the model's own tokens; a malformed action is
an observation, an environment that fails is an infra error. One driver
(`envs.driver`) steps every multi-turn episode, in the pipeline and in `pipeline.play`.

    Environment, StepResult   the contract (base.py)
    Trajectory                the token ledger of one episode
    driver                    the stepping functions every group lifecycle uses (pipeline/group.py)
    script_judge              a test script against a solution, in the sandbox (coding.py)
"""

from posttrain.envs.base import Environment, StepResult, Trajectory, make_environment
from posttrain.envs.coding import script_judge

__all__ = ["Environment", "StepResult", "Trajectory", "make_environment", "script_judge"]
