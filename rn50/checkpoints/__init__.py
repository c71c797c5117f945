"""Files of weights and state: the recipe's checkpoints and which one to use (checkpoint), the optimizer's
state and the workers' agreement on it (optimizer_state), weights of other origins (weights).
"""
