"""A web server in the background: start it, get a URL for its port, fetch it, stop it.

Needs an sbx-server with a port proxy (sbx-server --proxy_listen=...)."""

import urllib.request

import sbx

with sbx.Client() as client, client.claim("default", ttl=600) as sb:
    sb.files.write("site/index.html", "<h1>hello from a sandbox</h1>\n")
    # -u: unbuffered, so that its log reaches us as it is written.
    web = sb.processes.start(["python3", "-u", "-m", "http.server", "8000", "--bind", "127.0.0.1"],
                             cwd="site", tag="web")
    for line in web.stdout:  # its output so far, then live: wait until it listens
        if b"Serving HTTP" in line:
            break
    print([(p.tag, p.running) for p in sb.processes.list()])

    url = sb.url(8000, ttl=300)  # signed: whoever holds it may open it, until it expires
    with urllib.request.urlopen(str(url), timeout=10) as r:
        print(r.status, r.read().decode().strip())

    web.kill("TERM")
    print("web server stopped:", web.wait())  # -15: ended by SIGTERM
