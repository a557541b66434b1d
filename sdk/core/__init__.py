"""The core value types every part of capgate shares: estimates, decisions and plans
(:mod:`capgate.core.types`, :mod:`capgate.core.plans`), the backend protocol and sampling
settings (:mod:`capgate.core.backend`) and chat messages (:mod:`capgate.core.messages`).

The public names are re-exported by :mod:`capgate`.
"""
