"""Framework backends. Each produces events and answers framework questions for the core."""
