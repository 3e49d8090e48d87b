"""A second ``send`` task: routing by module-qualified name keeps them apart."""


async def send(to: str) -> str:
    return f"sms to {to}"
