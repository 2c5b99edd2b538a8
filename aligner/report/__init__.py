"""Terminal renderings shared by the commands."""
