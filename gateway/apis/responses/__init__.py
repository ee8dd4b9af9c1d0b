"""OpenAI's Responses API (/v1/responses): wire models, input translation, stored responses,
sealed reasoning and the stream event writer."""
