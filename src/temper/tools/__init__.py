"""Tools an agent calls, below the environments that offer them: chat tool calls in the Hugging Face
convention (`calls.py`: typed Python functions, their JSON schemas, parsing and validation), tools
with costs and dependencies (`registry.py`) and tools served by an MCP server (`mcp.py`)."""
