#!/bin/sh
# Make the TLS test's certificates in DIR with the openssl command (nothing checked in that
# could expire): a CA; a server certificate for localhost and 127.0.0.1 signed by it; a client
# certificate signed by it (mutual TLS); another CA that signed nothing the server shows; an
# expired server certificate (notAfter one day before notBefore); and three for the name check
# (at the end). EC P-256 keys, fast.
set -eu
dir=$1
cd "$dir"
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
key ca.key
openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj "/CN=redsem test CA" 2>/dev/null
key other-ca.key
openssl req -x509 -new -key other-ca.key -out other-ca.crt -days 2 -subj "/CN=another CA" 2>/dev/null
key server.key
openssl req -new -key server.key -out server.csr -subj "/CN=localhost" 2>/dev/null
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n' > server.ext
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out server.crt \
    -days 2 -extfile server.ext 2>/dev/null
openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out expired.crt \
    -days -1 -extfile server.ext 2>/dev/null
key client.key
openssl req -new -key client.key -out client.csr -subj "/CN=redsem test client" 2>/dev/null
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl x509 -req -in client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out client.crt \
    -days 2 -extfile client.ext 2>/dev/null
# Server certificates for the name check, all with server.key: a CN and no subject
# alternative name (refused: names are checked against SANs only); a partial wildcard SAN
# (refused); SANs and no CN (accepted).
san_cert() { # out subject ext
    openssl req -new -key server.key -out "$1.csr" -subj "$2" 2>/dev/null
    printf '%s\nextendedKeyUsage=serverAuth\n' "$3" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days 2 -extfile "$1.ext" 2>/dev/null
}
san_cert cn-only "/CN=localhost" ""
san_cert partial-wildcard "/O=redsem test" 'subjectAltName=DNS:r*.redsem.test'
san_cert san-only "/O=redsem test" 'subjectAltName=DNS:localhost,IP:127.0.0.1'
