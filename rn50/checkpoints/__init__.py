"""Files of weights and state: where a run's files are (workspace: one Workspace, folder and prefix), their
formats and reading any weights file into a network (checkpoint), which one a run resumes or a mode uses
(resume), the optimizer's state and the workers' agreement on it (optimizer_state), weights of other origins
(weights).
"""
