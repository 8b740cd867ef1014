"""Test double of nkilib (the NKI kernel library): only what the RoPE example uses."""
