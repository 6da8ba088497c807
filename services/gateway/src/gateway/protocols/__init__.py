"""Provider wire APIs. Each module holds its wire models plus ``to_canonical`` and the renderers of one API;
none imports another (no provider-to-provider conversion)."""
