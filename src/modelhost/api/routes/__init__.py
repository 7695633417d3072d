"""One router per API family."""
