"""Stream processing (faust-streaming): agents decode, call the domain, emit."""
