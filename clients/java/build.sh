#!/usr/bin/env bash
# Builds the Java SDK offline from Debian's packages (openjdk-17-jdk, junit5,
# libjackson2-databind-java), with javac, jar and JUnit's console launcher: Debian's Maven
# repository lacks the plugins an ordinary pom needs, and the build must not reach Maven Central.
# (`mvn package` on pom.xml builds the same sources from Maven Central.)
#
#   clients/java/target/settled-client-0.1.0.jar        the library
#   unit tests (JUnit 5): parsing, encoding, retries, outcomes, and the types against openapi.yaml
#   examples/java/target/settled-example-worker.jar     `java -jar`, its jars in target/lib/
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
JARS="${SETTLED_JAVA_JARS:-/usr/share/java}"
VERSION=0.1.0

for tool in javac jar java; do
  command -v $tool >/dev/null || { echo "build.sh: $tool is missing (apt-get install openjdk-17-jdk)" >&2; exit 1; }
done
javac -version 2>&1 | grep -Eq 'javac (1[7-9]|[2-9][0-9])' || { echo "build.sh: Java 17 or newer is needed: $(javac -version 2>&1)" >&2; exit 1; }
jackson=()
for j in jackson-databind jackson-core jackson-annotations; do
  [ -e "$JARS/$j.jar" ] || { echo "build.sh: $JARS/$j.jar is missing (apt-get install libjackson2-databind-java)" >&2; exit 1; }
  jackson+=("$JARS/$j.jar")
done
launcher="$JARS/junit-platform-console-standalone.jar"
[ -e "$launcher" ] || { echo "build.sh: $launcher is missing (apt-get install junit5)" >&2; exit 1; }
cp_of() { local IFS=:; echo "$*"; }

started=$SECONDS
out="$here/target"
rm -rf "$out"
mkdir -p "$out/classes" "$out/test-classes"

echo "java: compiling the library"
javac --release 17 -encoding UTF-8 -Xlint:-serial -Werror -d "$out/classes" -cp "$(cp_of "${jackson[@]}")" \
  $(find "$here/src/main/java" -name '*.java')
jar --create --file "$out/settled-client-$VERSION.jar" -C "$out/classes" .

echo "java: unit tests"
javac --release 17 -encoding UTF-8 -d "$out/test-classes" -cp "$(cp_of "$out/classes" "${jackson[@]}" "$launcher")" \
  $(find "$here/src/test/java" -name '*.java')
java -Dsettled.openapi="$root/openapi.yaml" -jar "$launcher" --disable-banner --details=summary --fail-if-no-tests \
  --class-path "$(cp_of "$out/test-classes" "$out/classes" "${jackson[@]}")" --scan-class-path "$out/test-classes" \
  --reports-dir "$out/test-reports"

echo "java: building the example worker"
ex="$root/examples/java/target"
rm -rf "$ex"
mkdir -p "$ex/classes" "$ex/lib"
cp "$out/settled-client-$VERSION.jar" "$ex/lib/settled-client.jar"
for j in "${jackson[@]}"; do cp -L "$j" "$ex/lib/"; done
javac --release 17 -encoding UTF-8 -Werror -d "$ex/classes" -cp "$(cp_of "$ex/lib/settled-client.jar" "${jackson[@]}")" \
  $(find "$root/examples/java/src/main/java" -name '*.java')
cat >"$ex/MANIFEST.MF" <<MF
Main-Class: example.ExampleWorker
Class-Path: lib/settled-client.jar lib/jackson-databind.jar lib/jackson-core.jar lib/jackson-annotations.jar
MF
jar --create --file "$ex/settled-example-worker.jar" --manifest "$ex/MANIFEST.MF" -C "$ex/classes" .
echo "java: built $out/settled-client-$VERSION.jar and $ex/settled-example-worker.jar in $((SECONDS - started)) s"
