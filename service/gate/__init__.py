"""The deploy gate: policies, webhook secrets, decisions, promotion and repair."""
