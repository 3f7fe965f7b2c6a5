"""Built-in plugins, registered through the same hooks as installed ones."""
