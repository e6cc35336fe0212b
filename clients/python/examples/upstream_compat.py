"""A script written the way upstream agent-sandbox's Python SDK documents it; only the
import differs (was: from k8s_agent_sandbox import SandboxClient)."""

from sbx.compat import SandboxClient

client = SandboxClient()

sandbox = client.create_sandbox(
    warmpool="default",
    namespace="default",
)
try:
    sandbox.files.write(
        "hello.py",
        'print("Hello, World! Greetings from inside the sandbox.")\n',
    )
    result = sandbox.commands.run("python3 hello.py")
    print(result.stdout, end="")
    print(sandbox.files.exists("hello.py"), [e.name for e in sandbox.files.list(".")])
finally:
    sandbox.terminate()
