"""What a job reads: the model and its tokenizer (`models`), the dataset and its
prompts (`data`)."""
