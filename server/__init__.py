"""The registry's HTTP service (issue 5): it will translate HTTP to calls of the registry library."""
