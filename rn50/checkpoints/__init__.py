"""Files of weights and state: where a run's files are (workspace: one Workspace, folder and prefix), the
formats the recipe writes and reads back (checkpoint), what a training run's states hold, when they are written
and how a run continues from one (saver: the Saver fit.py asks), which one a run resumes or a mode uses (resume),
the optimizer's state and the workers' agreement on it (optimizer_state), any weights file read into a network
(weight_files: the foreign formats beside the recipe's own) and weights of other origins recognised and
converted (weights).
"""
