"""C3RL: teach a model to end its answers with ``[confidence=X%]``, and to mean it.

The rewards (:mod:`capgate.train.rewards`), their settings (:mod:`capgate.train.config`), graded
synthetic questions (:mod:`capgate.train.synthetic`) and the run itself
(:func:`capgate.train.trainer.train_c3rl`, ``capgate train c3rl``). The training needs the
``train`` extra (TRL, PEFT); importing this package does not import them, nor torch.
"""
