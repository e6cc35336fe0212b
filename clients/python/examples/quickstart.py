import sbx

with sbx.Client() as client, client.claim("default", ttl=600) as sb:
    result = sb.exec("echo hello from $(hostname); uname -sm")
    print(result.stdout, end="")
