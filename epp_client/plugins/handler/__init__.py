"""Profile handlers: which scheduling profiles run for a request, and the headers they imply."""
