"""A ``send`` task; sms_tasks has another one with the same ``__name__``."""


async def send(to: str) -> str:
    return f"mail to {to}"
