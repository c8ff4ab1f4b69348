"""Small MCP servers (official `mcp` SDK, stdio transport) that ship with temper, so the MCP path
of the tool registry is tested and demonstrated without any network."""
