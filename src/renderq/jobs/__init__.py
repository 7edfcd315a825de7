"""Prompt files and seeds, the job runner (``renderq run`` and the service's bulk jobs)."""
