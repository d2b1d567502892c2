"""`python -m llamaserve [llama-server flags]`."""

from llamaserve.cli import entry_llama_server

if __name__ == "__main__":
    entry_llama_server()
