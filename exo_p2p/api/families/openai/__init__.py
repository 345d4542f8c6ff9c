"""OpenAI's API families: chat completions (``chat``, ``chat_tools``), legacy completions
(``completions``) and Responses (``responses``, ``responses_tools``, ``responses_include``,
``sealed_reasoning``)."""
