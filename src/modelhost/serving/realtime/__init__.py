"""OpenAI's Realtime API (`/v1/realtime`, docs/realtime.md): one session per WebSocket, composed of the
account's deployments (chat; speech recognition and text-to-speech where the session names them).

`session.RealtimeSession` is the protocol's state machine, testable without a socket: the route
(`api.routes.realtime`) hands it each text frame and sends what it emits. `conversation` keeps the
session's items, bounded; `audio` converts the protocol's audio formats with the one media decoder.
"""
