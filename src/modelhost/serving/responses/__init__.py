"""The Responses API: stored responses chained by `previous_response_id`, on the chat generation path."""
