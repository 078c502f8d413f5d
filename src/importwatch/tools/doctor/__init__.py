"""`importwatch doctor`: check an environment before the job runs, each risky step in a killable child."""
