import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

/**
 * Publishes hits to streamlimit and reads their count back, with Apache Kafka's Java client.
 *
 * <pre>
 * java -cp 'libs/*' StreamlimitClient.java --brokers localhost:9092 --key 'api|user=42#60s' --hits 5
 * </pre>
 *
 * publishes 5 hits of 1 for the key at site "java" as JSON records keyed by the counter key
 * (the client's default partitioner puts them on the partition that owns the key), then
 * prints the key's count once the aggregator's count includes them, and exits 0; it exits 1
 * when the count does not arrive within --timeout seconds.
 */
public final class StreamlimitClient {
    public static void main(String[] argv) throws Exception {
        Map<String, String> a = new HashMap<>(Map.of(
                "--brokers", "localhost:9092", "--hits-topic", "hits", "--counts-topic", "counts",
                "--site", "java", "--window-ms", "60000", "--hits", "1", "--timeout", "60"));
        for (int i = 0; i + 1 < argv.length; i += 2) {
            a.put(argv[i], argv[i + 1]);
        }
        String key = a.get("--key");
        if (key == null) {
            System.err.println("--key is required");
            System.exit(2);
        }
        int hits = Integer.parseInt(a.get("--hits"));
        publish(a.get("--brokers"), a.get("--hits-topic"), key, a.get("--site"), Long.parseLong(a.get("--window-ms")), hits);
        Count c = awaitCount(a.get("--brokers"), a.get("--counts-topic"), key, a.get("--site"), hits,
                Duration.ofSeconds(Long.parseLong(a.get("--timeout"))));
        if (c == null) {
            System.err.printf("no count of %d for %s at site %s%n", hits, key, a.get("--site"));
            System.exit(1);
        }
        StringBuilder sites = new StringBuilder();
        for (Map.Entry<String, Double> e : new TreeMap<>(c.sites).entrySet()) {
            sites.append(' ').append(e.getKey()).append('=').append(fmt(e.getValue()));
        }
        System.out.printf("count %s total=%s%s%n", c.key, fmt(c.total), sites);
    }

    private static String fmt(double v) {
        return v == Math.rint(v) ? Long.toString((long) v) : Double.toString(v);
    }

    /** A hit in the contract's JSON form; ts, w and n are JSON integers. */
    static String hitJson(String key, String site, long windowMs, long n) {
        return "{\"key\":" + quote(key) + ",\"site\":" + quote(site) + ",\"ts\":" + System.currentTimeMillis()
                + ",\"w\":" + windowMs + ",\"n\":" + n + "}";
    }

    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                b.append('\\').append(ch);
            } else if (ch < 0x20) {
                b.append(String.format("\\u%04x", (int) ch));
            } else {
                b.append(ch);
            }
        }
        return b.append('"').toString();
    }

    static void publish(String brokers, String topic, String key, String site, long windowMs, int hits) throws Exception {
        Properties p = new Properties();
        p.put("bootstrap.servers", brokers);
        p.put("key.serializer", StringSerializer.class.getName());
        p.put("value.serializer", StringSerializer.class.getName());
        // No partitioner set: the default hashes the key with murmur2, as streamlimit expects.
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(p)) {
            for (int i = 0; i < hits; i++) {
                producer.send(new ProducerRecord<>(topic, key, hitJson(key, site, windowMs, 1))).get();
            }
        }
    }

    /** One count record: the key, its total and its per-site counts. */
    static final class Count {
        String key;
        double total;
        Map<String, Double> sites = new HashMap<>();
    }

    static Count awaitCount(String brokers, String topic, String key, String site, double want, Duration timeout) throws java.io.IOException {
        Properties p = new Properties();
        p.put("bootstrap.servers", brokers);
        p.put("key.deserializer", ByteArrayDeserializer.class.getName());
        p.put("value.deserializer", ByteArrayDeserializer.class.getName());
        p.put("enable.auto.commit", "false");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(p)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo pi : consumer.partitionsFor(topic)) {
                parts.add(new TopicPartition(topic, pi.partition()));
            }
            // Every partition from the start: the compacted topic holds every key's count.
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long deadline = System.nanoTime() + timeout.toNanos();
            while (System.nanoTime() < deadline) {
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(500))) {
                    if (r.key() == null || r.value() == null || !key.equals(new String(r.key(), StandardCharsets.UTF_8))) {
                        continue; // another key, or a tombstone (the count fell to zero)
                    }
                    Count c = decode(r.value());
                    if (Math.abs(c.sites.getOrDefault(site, 0.0) - want) < 1e-9) {
                        return c;
                    }
                }
            }
        }
        return null;
    }

    static final ObjectMapper JSON = new ObjectMapper();

    /**
     * Decodes a count in either form the aggregator writes (--counts-format): JSON, read here
     * with Jackson, or binary version 2 or 1, told apart by the first byte.
     */
    static Count decode(byte[] v) throws java.io.IOException {
        if (v.length > 0 && v[0] == '{') {
            JsonNode n = JSON.readTree(v);
            Count c = new Count();
            c.key = n.get("key").asText();
            c.total = n.get("total").asDouble();
            n.get("sites").fields().forEachRemaining(e -> c.sites.put(e.getKey(), e.getValue().asDouble()));
            return c;
        }
        ByteBuffer b = ByteBuffer.wrap(v).order(ByteOrder.LITTLE_ENDIAN);
        int version = b.get();
        if (version != 1 && version != 2) {
            throw new IllegalArgumentException("unknown count version " + version);
        }
        Count c = new Count();
        c.key = string(b);
        uvarint(b); // window, ms
        uvarint(b); // as-of, zig-zag
        if (version == 2) {
            uvarint(b); // sub-buckets
        }
        c.total = b.getDouble();
        long n = uvarint(b);
        for (long i = 0; i < n; i++) {
            String s = string(b);
            c.sites.put(s, b.getDouble());
            if (version == 2) {
                b.getDouble(); // demand
            }
        }
        return c;
    }

    static String string(ByteBuffer b) {
        byte[] s = new byte[(int) uvarint(b)];
        b.get(s);
        return new String(s, StandardCharsets.UTF_8);
    }

    static long uvarint(ByteBuffer b) {
        long x = 0;
        for (int shift = 0; ; shift += 7) {
            int c = b.get() & 0xff;
            x |= (long) (c & 0x7f) << shift;
            if (c < 0x80) {
                return x;
            }
        }
    }
}
