"""Reading a local model: preparing and loading its weights, the CPU check, the partial forward
pass, the shared prefill, request coalescing and the hidden-state features a probe reads.

Choosing and loading an *estimator* over a local model sits above this folder, in
:func:`capgate.load_estimator`; the estimators read a model through
:class:`capgate.local.hidden_states.HiddenStateFeaturizer`.
"""
