"""`importwatch bisect`: narrow a hanging program down to the imports that still hang."""
