"""What each job kind runs: the dispatch (entry: pretrain and finetune run the training loop, train/loop/trainer.py), evaluation, generation, export."""
