"""States and fixtures for the pure rules of master/ and worker/ (placement, heal, plan, relink,
restore, submit, memory), simulations of the election and the control plane, and hypothesis
strategies.
"""
