"""Files of weights and state: where a run's files are (workspace: one Workspace, folder and prefix), the
formats the recipe writes and reads back (checkpoint), what a training run's states hold, when they are written
and how a run continues from one (saver: the Saver fit.py asks), which one a run resumes or a mode uses (resume),
the optimizer's state and the workers' agreement on it (optimizer_state), any weights file read and loaded into a
network (weight_loading: the foreign formats beside the recipe's own), which network and origin a parameter
dictionary holds (weight_origins: this recipe, NVIDIA's, GluonCV, torchvision/timm) and its conversion to this
recipe's network and back out under torchvision's names (weight_conversion).
"""
