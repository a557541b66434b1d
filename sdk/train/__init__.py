"""C3RL: teach a model to end its answers with ``[confidence=X%]``, and to mean it.

The rewards (:mod:`capgate.train.rewards`), their settings (:mod:`capgate.train.config`), graded
synthetic questions (:mod:`capgate.train.synthetic`) and the run itself (:func:`train_c3rl`,
``capgate train c3rl``). The training needs the ``train`` extra (TRL, PEFT); importing this package
imports neither, nor torch.

Examples:
    >>> from capgate.train import C3RLRewardConfig, c3rl_reward_functions
    >>> [f.__name__ for f in c3rl_reward_functions(C3RLRewardConfig())]
    ['c3rl_correctness', 'c3rl_calibration', 'c3rl_reference', 'c3rl_format']
"""

from capgate.train.config import C3RLRewardConfig, C3RLTrainConfig
from capgate.train.rewards import (
    C3RLReward,
    RewardBreakdown,
    c3rl_reward_functions,
    read_tag,
    score_completion,
)
from capgate.train.synthetic import arithmetic_items, arithmetic_prompt, tagged_arithmetic_prompt
from capgate.train.trainer import C3RLRun, train_c3rl

__all__ = [
    "C3RLReward",
    "C3RLRewardConfig",
    "C3RLRun",
    "C3RLTrainConfig",
    "RewardBreakdown",
    "arithmetic_items",
    "arithmetic_prompt",
    "c3rl_reward_functions",
    "read_tag",
    "score_completion",
    "tagged_arithmetic_prompt",
    "train_c3rl",
]
