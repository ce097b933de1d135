"""The scoring service: validation, core (plain types) and the gRPC servicer."""
