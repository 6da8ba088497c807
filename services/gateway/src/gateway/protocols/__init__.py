"""Provider wire APIs, one module per ``contracts.Protocol`` member, named after its value (``openai_chat.py``).

Each module holds its wire models plus ``to_canonical`` and the renderers of one API (``render_json``, ``stream``);
none imports another (no provider-to-provider conversion). ``stream`` takes the provider's ``error_body`` for its
in-stream error event: APIs of one provider share it, and it lives with their routes (``gateway.routes.<provider>``).
"""
