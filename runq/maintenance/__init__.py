"""Maintenance services: periodic passes over the run table that the daemon and the CLI share."""
