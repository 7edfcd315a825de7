"""renderq serve: the HTTP service for interactive renders and bulk jobs."""
