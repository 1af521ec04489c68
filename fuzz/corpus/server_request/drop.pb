b
gpt2.ln_f:v1