"""Projects: the owners of lines and data sets, their members' roles, and request scoping."""
