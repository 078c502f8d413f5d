"""`importwatch report`: read a log later, as a summary, a tree or another tool's format."""
