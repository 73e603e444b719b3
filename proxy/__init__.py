"""brim's HTTP face: the app, one route module per wire API, config and the command line."""
