"""What a row's decoded text becomes: ``parser`` (content, reasoning and tool calls), ``stop``
(stop strings), ``constraint`` (grammar masks) and ``tools`` (tools and reasoning in the prompt,
the parser and grammar of a request's answer).
"""
