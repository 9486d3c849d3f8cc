"""posttrain.envs: multi-turn episodes on the Environment contract (reset, step).

Invariant: an environment's observations enter the model's context with loss
mask 0, so the loss covers only the model's own tokens; a malformed action is
an observation, an environment that fails is an infra error.

    CodingEnv(judge)  the coding loop: code -> sandboxed tests -> error output -> revise
    ToolEnv(tools)    the tool loop: JSON calls against declared ToolSpecs, violations counted
"""
from posttrain.envs.base import Environment, Trajectory, make_environment
from posttrain.envs.coding import CodingEnv, CodingOutcome, code_domain_judge, script_judge
from posttrain.envs.tool import ANSWER, ToolEnv, ToolOutcome, ToolSpec, parse_call

__all__ = [
    "Environment", "Trajectory", "make_environment", "CodingEnv", "CodingOutcome", "code_domain_judge", "script_judge",
    "ToolEnv", "ToolOutcome", "ToolSpec", "ANSWER", "parse_call",
]
