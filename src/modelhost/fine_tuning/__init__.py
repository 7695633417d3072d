"""Fine-tuning jobs (OpenAI's `/v1/fine_tuning/jobs`, docs/fine-tuning.md): a LoRA adapter trained with
PEFT on a deployment's base, in a worker process, ending as an adapter artifact."""
