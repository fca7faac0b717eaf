"""Reading an experiment folder: the monitor (tables and findings), plots, reports, the notebook dashboard and the
study analysis. Never writes to the folder; only entry points import it."""
