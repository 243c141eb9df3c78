"""What each job kind runs: the dispatch (entry), training, evaluation, generation."""
