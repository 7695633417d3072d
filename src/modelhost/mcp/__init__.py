"""Hosted MCP tools (issue 63): the account allow-list of MCP servers, the vetted MCP client, and the
tool loop the Responses and Messages APIs share (docs/responses.md, "MCP tools")."""
